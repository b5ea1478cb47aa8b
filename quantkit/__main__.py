from quantkit.cli import main

main()
